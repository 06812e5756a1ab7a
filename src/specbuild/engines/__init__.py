"""The engine room: everything that loads, keeps, shares, sizes and frees a model.

An engine is a loaded model doing work for jobs: an SGLang server (`server`), SGLang's model
runner in this process (`runner`), a transformers model (`transformers`), or a feature
backend built on one of those (`model`). A spec says what loads an engine and is the key jobs
share it by; `runtime.Runtime` holds the settings that change no output (memory share, idle
seconds); `open.open_engine` returns the job's own engine or the one a keeper holds
(`keepers`, `kept_server`, `kept_model`; in a SLURM allocation, `keeper_host` starts them).
GPU pinning and start-up locks are `gpus`; the HTTP helpers every client of a server shares
are `http`; the one table of what is loaded by name is `registry`.

Imports run one way: stages import engines, engines import infrastructure, never a stage.
"""
