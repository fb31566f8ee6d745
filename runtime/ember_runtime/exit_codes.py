"""How a replica process ends, as the agent that started it reads its exit code."""

EXIT_SETUP_FAILED = 3  # the app's import or its @ember.setup raised: starting it again will most likely fail again
EXIT_SETUP_TIMED_OUT = 4  # the import and setup took longer than the service's startup_timeout_s
SETUP_FAILURES = frozenset({EXIT_SETUP_FAILED, EXIT_SETUP_TIMED_OUT})  # a few in a row: the version is failed
EXIT_ABANDONED_SETUP = 143  # stopped during setup, which cannot be interrupted (as if killed by SIGTERM)
EXIT_TERMINATED = 5  # a call it ran was cancelled with terminate: it leaves at once, as if crashed, and is replaced
