"""One tuning run: its configuration, the ask/tell loop over the executor, the vendor's
figures, the best's confirmation, and what the user sees while it runs.
"""
