"""Programs that CI and developers run at toy scale on CPU: the GRPO smoke and the whole-loop smoke.

They may import every other part of ``trainer`` and ``services``; nothing in ``trainer`` imports them.
"""
