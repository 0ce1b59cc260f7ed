SET LOCAL jit = off
