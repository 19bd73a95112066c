"""While training, pure decisions: measured windows in, lanes/capacity/pool settings out; touches no graph."""
