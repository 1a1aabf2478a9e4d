# Convenience targets. `make report` writes reports/align.html from data_samples/ (installing
# into ./.venv first when it has no eagleforensics); scripts/report.sh does the same and more.
VENV ?= .venv
EAGLEFORENSICS ?= $(VENV)/bin/eagleforensics
SAMPLES := data_samples/record_layer_outputs.pt data_samples/capture.pt

.PHONY: report test lab
report: reports/align.html

reports/align.html: $(SAMPLES) notebooks/align.ipynb | $(EAGLEFORENSICS)
	$(EAGLEFORENSICS) report $(SAMPLES) -o $@ || [ $$? -eq 1 ]  # 1: ACTION, the incident's verdict

$(EAGLEFORENSICS):
	[ -x $(VENV)/bin/python ] || python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q -c constraints.txt -e '.[report]'

test:
	bash scripts/test.sh

lab:
	bash scripts/lab.sh
