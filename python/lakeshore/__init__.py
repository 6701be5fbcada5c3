"""Helpers for bodies: the processes nymph, lakeshore's on-host agent, runs.

``from lakeshore import lifecycle`` talks to the run's lifecycle endpoint.
"""
