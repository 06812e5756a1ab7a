"""Bench tables and plots for the Snakemake report."""
