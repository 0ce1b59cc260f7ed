SELECT set_config('application_name', %s, false)
