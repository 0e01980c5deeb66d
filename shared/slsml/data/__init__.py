"""Datasets in S3 and the order in which a run reads them."""
