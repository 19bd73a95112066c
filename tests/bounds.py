"""The bounds on waits in tests: each catches a hang and never checks a speed, so a test passes on a loaded
machine (other jobs on the same 2 cores) as on a quiet one, and a bug still fails instead of hanging.

    sess.run(y, options=tf.compat.v1.RunOptions(timeout_in_ms=HANG_MILLIS))
    proc = subprocess.run([...], timeout=JOB_HANG_SECONDS)

Each bound is at least 20 times the work it waits for on a quiet 2-core machine.
"""

# A wait on work that takes under a second on a quiet machine: a step, a thread starting or stopping, a
# buffer filling, a server answering.
HANG_SECONDS = 300.0
HANG_MILLIS = int(HANG_SECONDS * 1000)

# A child process that imports TensorFlow and builds or trains a small model: under a minute on a quiet
# machine.
JOB_HANG_SECONDS = 1200.0
