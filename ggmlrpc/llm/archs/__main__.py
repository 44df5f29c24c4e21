"""Print the README's table of architectures."""
from . import readme_table

print(readme_table())
