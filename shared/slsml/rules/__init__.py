"""Update rules beyond plain gradient averaging: model averaging and ADMM."""
