"""Session start: graph surgery that adds a stage's lanes (queues, body copies, remote lanes); starts no thread."""
