SET LOCAL synchronous_commit = on
