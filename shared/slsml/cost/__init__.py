"""The analytic time and cost model of a run, ``slsml plan``'s report, and the worker-count tuner."""
