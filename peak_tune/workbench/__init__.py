"""One step at a time: apply a transformation, look at the diff, keep checkpoints; the MCP
server over the same steps.
"""
