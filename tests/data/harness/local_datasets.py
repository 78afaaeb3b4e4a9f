"""The local tasks' documents (`custom_dataset` of the YAML files beside): JSON lines read
from this folder, so the tasks run offline from any working directory."""

import json
import os

import datasets

HERE = os.path.dirname(os.path.abspath(__file__))


def rows(name: str) -> list[dict]:
  with open(os.path.join(HERE, name)) as f:
    return [json.loads(line) for line in f if line.strip()]


def choice(**metadata) -> dict:
  del metadata
  return {'test': datasets.Dataset.from_list(rows('choice.jsonl'))}


def rolling(**metadata) -> dict:
  del metadata
  return {'test': datasets.Dataset.from_list(rows('rolling.jsonl'))}


def generate(**metadata) -> dict:
  del metadata
  return {'test': datasets.Dataset.from_list(rows('generate.jsonl'))}
