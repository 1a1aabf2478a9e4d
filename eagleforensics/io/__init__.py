"""io: reading files safely and lazily.

Safe loading (no code-running pickles), size checks before allocation, the training-record
layouts, the capture layouts, row streaming and prefetch, and the capture helper that runs a
local Hugging Face model, and the reader of replay's JSON for ``plan`` (``replayfile``). Imports only ``errors``, ``positions``, ``results``, ``arrays`` and its
own room. Everything handed up is numpy (``arrays``); torch is imported only to read
``.pt``/``.ckpt`` files, to run a model (``sweep``) and for the drafter replay runs (``drafter``).
"""
