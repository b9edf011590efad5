"""The Optuna study's storage: databases, the in-memory mirror the sampler reads, and
batched writes.
"""
