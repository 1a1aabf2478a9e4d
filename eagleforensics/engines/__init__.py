"""engines: the serving side.

The engine rules table (which id captures which position, per engine and version), the draft
config audit, the cross-check of serving against training, the server-log reader, the server
arguments line (``serverargs``, through the bounded repr reader ``pyrepr``) and the launch rules
(``launchrules``: algorithm, draft path, pipeline parallelism, stats interval per release), and
the serving-path suspects with what a run's arguments say about each (``suspects``). Imports
``io`` and the bottom (``errors``, ``positions``, ``results``); never ``evidence``, ``scan``,
``report`` or the pipeline.
"""
