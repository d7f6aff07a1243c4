"""Graph builders per architecture (src/models/*.cpp)."""
