"""The tasks of the Tasks backend tests, in an app of their own: installed only when there is a
Tasks framework (see ``tests/settings.py``), so the worker's discovery of ``tasks`` modules
never meets them without one."""
