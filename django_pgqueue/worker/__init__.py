"""The worker: handler registry, fetch -> execute -> complete loop, listener, signals."""
