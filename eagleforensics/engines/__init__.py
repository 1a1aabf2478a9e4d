"""engines: the serving side.

The engine rules table (which id captures which position, per engine and version), the draft
config audit, the cross-check of serving against training, and the server-log reader. Imports
``io`` and the bottom (``errors``, ``positions``, ``results``); never ``evidence``, ``scan``,
``report`` or the pipeline.
"""
