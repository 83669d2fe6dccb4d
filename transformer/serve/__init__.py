"""Serving: ``transformer-serve`` answers translation requests over HTTP, on the same `Translator` as the CLI.

`app.py` is the FastAPI application (routes, errors, the page), `schema.py` the JSON it reads and
writes, `config.py` the service's limits, `batcher.py` gathers concurrent requests into shared
translator calls, `model_info.py` says what the model is, and `static/` holds the page.
``transformer.cli.serve`` runs it on uvicorn.
Needs the `serve` extra: ``pip install -e ".[serve]"``.
"""
