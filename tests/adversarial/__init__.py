"""Adversarial tier: every entry point fed the input an attacker or a careless user gives."""
