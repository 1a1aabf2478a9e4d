"""drafter: the EAGLE-3 drafter run offline (plain torch) on the states a wiring feeds it, and the
acceptance it reaches; what ``replay`` and the doctor's replay row measure with.

Imports ``io``, ``evidence`` and the bottom; never ``engines``, ``checks``, ``report`` or a pipeline.
"""
