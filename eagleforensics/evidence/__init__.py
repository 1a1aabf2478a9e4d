"""evidence: from two sets of hidden states to numbers and decisions.

Per-token sums and scores (numpy, the compiled kernels, ``gpu`` for CUDA), norms, layer steps, token
pairing, identity and fidelity, confidence bars, capture fingerprints and their scoring, the findings
derived from placed slots. The subjects built on it have rooms of their own: ``drafter`` (the drafter run
offline), ``dataaudit`` (the training-data audit) and ``serving`` (round cost, accept curves, the serving
gap). Imports ``io`` and the bottom (``errors``, ``positions``, ``records``); never ``engines``, ``scan``,
``report`` or a pipeline.
"""
