"""placeholder"""
def attacks(): return []
