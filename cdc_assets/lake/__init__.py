"""lake"""
