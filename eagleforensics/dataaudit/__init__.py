"""dataaudit: the training-data audit: were the records written by this target (agreement), in the
template the server uses (templates), and the per-record lines and dataset findings (audit).

Imports ``io``, ``evidence`` and the bottom; never ``engines``, ``checks``, ``report`` or a pipeline.
"""
