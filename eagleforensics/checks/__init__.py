"""checks: the doctor's checks, one small module per cause of low acceptance, found through a registry.

Each module registers one ``Check`` (``registry.register``): the inputs it needs, the stable
finding codes it may emit (a contract, listed in the README), and a function from the lazily
loaded artifacts (``base.Artifacts``) to findings. ``registry.all_checks()`` is the list the
``doctor`` pipeline runs. Imports ``io``, ``evidence``, ``engines``, ``scan`` and the bottom
(``errors``, ``positions``, ``results``, ``arrays``); never ``report``, ``cli`` or a pipeline.
"""
