"""What every recipe (``trainer loop``, ``trainer experiment pi1-ab|pi2-ab``, ``trainer demo``) shares: the run
manifest (``manifest.py``) and the one rule for reusing a finished phase (``reuse.py``)."""
