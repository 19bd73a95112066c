"""Session lifecycle: hooks that start and stop the producers, report the pipeline and re-initialise stages."""
