"""While training, the threads: the producers that run a stage's puts and lanes to fill its buffer."""
