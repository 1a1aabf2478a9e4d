"""testing: not the product. Tiny real models and generated datasets for tests and demos.

``tinymodels`` builds small Llama / Qwen3 / DeepSeek-V3 models from transformers' own modeling
code (random weights, randomised norm gains) whose forward passes give real residual streams;
``scandata`` writes a dataset with planted faults from them; ``runlogs`` writes SGLang / vLLM server
logs in each release's format from a known round-cost model (for ``plan``'s tests and the README's
incident). Tests, scripts, benchmarks and the
scan notebook's demo use these; no command of the tool does. Needs the ``capture`` extra.
"""
