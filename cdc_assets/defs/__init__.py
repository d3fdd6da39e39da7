"""defs"""
