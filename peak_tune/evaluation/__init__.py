"""Evaluating a variant: the pipeline from a sequence to a measured outcome, its
validation, and the cache that makes every repeat free.
"""
