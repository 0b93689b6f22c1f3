"""Compiler: model graphs to chip programs and memory images."""
