"""The hyperparameter search's engine and records, apart from the runs that carry it out: the search space a
KerasTuner build function declares, mapped onto Optuna's sampler and pruners (``space``, ``engine``), and what a
search and its trials leave beside the run table so that it can go on after an interruption (``records``)."""
