from harness.cli import console

console()
