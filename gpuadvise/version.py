"""The package version, in a module of its own: the renderers quote it without importing the
package root (which imports the public API, which imports the renderers)."""

__version__ = "0.1.0"
