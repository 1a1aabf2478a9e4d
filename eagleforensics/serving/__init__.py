"""serving: what a speculative round costs and what a server should accept, for ``plan`` and ``probe``:
the round-cost fit (roundcost), accept length per step count (acceptcurve), the serving-gap bar
(servinggap).

Imports ``io``, ``evidence`` and the bottom; never ``engines``, ``checks`` or a pipeline.
"""
