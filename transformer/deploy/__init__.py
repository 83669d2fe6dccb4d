"""Deployment: a trained checkpoint turned into something a user runs without this repository's runs."""
