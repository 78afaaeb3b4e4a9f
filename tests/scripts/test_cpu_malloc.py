"""The malloc re-exec happens once, only when needed, and can be turned off."""

import os

import pytest

from longformer_jax import cpu_malloc


@pytest.fixture
def execve_calls(monkeypatch):
  calls = []
  monkeypatch.setattr(os, 'execve', lambda path, argv, env: calls.append(env))
  monkeypatch.setattr(cpu_malloc, 'has_accelerator', lambda: False)
  for name in (*cpu_malloc.SETTINGS, 'LONGFORMER_JAX_MALLOC'):
    monkeypatch.delenv(name, raising=False)
  return calls


def test_reexecs_with_settings_when_missing(execve_calls):
  cpu_malloc.reexec_with_cpu_malloc_settings()
  assert len(execve_calls) == 1
  assert all(execve_calls[0][k] == v for k, v in cpu_malloc.SETTINGS.items())


def test_no_reexec_when_already_set(execve_calls, monkeypatch):
  for name, value in cpu_malloc.SETTINGS.items():
    monkeypatch.setenv(name, value)
  cpu_malloc.reexec_with_cpu_malloc_settings()
  assert execve_calls == []


def test_no_reexec_when_disabled_or_on_accelerator(execve_calls, monkeypatch):
  monkeypatch.setenv('LONGFORMER_JAX_MALLOC', '0')
  cpu_malloc.reexec_with_cpu_malloc_settings()
  monkeypatch.delenv('LONGFORMER_JAX_MALLOC')
  monkeypatch.setattr(cpu_malloc, 'has_accelerator', lambda: True)
  cpu_malloc.reexec_with_cpu_malloc_settings()
  assert execve_calls == []
