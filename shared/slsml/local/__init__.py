"""The embedded cloud: the real pipeline functions on one machine, against moto in server mode."""
