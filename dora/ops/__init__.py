"""Operators: dataset, generate (engines), reward, reference, advantage, update, critic, filter."""
