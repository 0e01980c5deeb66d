"""The analytic time and cost model of a run, its workers on Lambda's CPUs or on GPUs (Lambda Managed Instances),
``slsml plan``'s report, and the worker-count tuner."""
