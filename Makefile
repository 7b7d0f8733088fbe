# Sluice: the two set-up commands are `make run` and `make test` (see README.md).
CARGO ?= cargo
THREADS ?= 2

.PHONY: run engine chat test fetch-model build lint bench deny fuzz rdma cuda-check
fetch-model:
	./scripts/fetch-model.sh

build:
	$(CARGO) build --release --workspace

## Runs Sluice: the HTTPS gateway on https://127.0.0.1:8443 (policies/default.toml), which
## starts and supervises the bundled three-rank engine on the real model. On first run it
## generates a development CA in certs/ and prints the path to trust.
run: fetch-model build
	./target/release/sluice serve $${LISTEN:+--listen $$LISTEN}

## The bundled engine alone, without the gateway: OpenAI API on 127.0.0.1:8000.
engine: fetch-model build
	./target/release/sluice-engine serve --ranks 3 --listen $${LISTEN:-127.0.0.1:8000}

## A one-shot chat answer from the engine, no server.
chat: fetch-model build
	./target/release/sluice-engine generate --chat --threads $(THREADS) --max-tokens 128 \
	  --prompt "$${PROMPT:-Explain in two sentences why admission control matters for an LLM server.}"

## Everything CI checks: formatting, lints, the test suite against the real model.
test: fetch-model lint
	$(CARGO) test --release --workspace --no-fail-fast

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

bench: fetch-model build
	./target/release/sluice-engine bench --threads $(THREADS)

## The engine with the RDMA transport (`--transport rdma`, docs/transport.md), built into
## target/rdma so that the default build in target/release (which never links libibverbs) is
## left alone. Needs the Debian packages cmake pkg-config libnl-3-dev libnl-route-3-dev
## libclang-dev libibverbs-dev, and python3 (ibverbs-sys runs cmake and bindgen over rdma-core;
## the binary links the system libibverbs). Binary: target/rdma/release/sluice-engine.
RDMA_TARGET ?= target/rdma
rdma:
	CARGO_TARGET_DIR=$(RDMA_TARGET) $(CARGO) build --release -p sluice-engine --features rdma

## The dependency policy (deny.toml): licenses, bans, sources. `cargo deny check` adds the
## advisories, where the RustSec database (on GitHub) can be fetched.
deny:
	$(CARGO) deny check licenses bans sources

## A fuzz target for a while (docs/reliability.md): make fuzz TARGET=request SECS=300
## (targets: request, policy, gguf, frame). Needs cargo-fuzz; stable Rust via RUSTC_BOOTSTRAP.
TARGET ?= request
SECS ?= 60
fuzz: fetch-model
	cd fuzz && RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run $(TARGET) -- -max_total_time=$(SECS)

## The CUDA kernels, checked with no GPU: NVRTC compiles each for compute_90 and compute_80,
## ptxas -v assembles it for sm_90 (one line per kernel: registers, shared memory, spills); fails
## on an error or a spill. Installs NVRTC and ptxas from PyPI under ~/.cache/sluice/cuda12.
cuda-check:
	./scripts/cuda-check.sh
