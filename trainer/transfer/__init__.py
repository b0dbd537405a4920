"""Moving a run folder's finished work to another node (`trainer loop pack` / `trainer loop unpack`)."""
