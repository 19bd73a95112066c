"""Build time: what `staged()` writes into the user's graph (ops, a StageDef, target marks)."""
