"""motion"""
