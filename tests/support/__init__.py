"""What the tests share: builders of wire values and specs, the test platform, polling."""
