"""cdc-lakehouse"""
