"""What a run is and what its functions say to each other: the run config, the pipeline's messages, where
every object lives, which topic feeds which function, and the errors that name what is wrong."""
