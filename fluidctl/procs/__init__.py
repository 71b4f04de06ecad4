"""Processes on this machine: start them, stop their whole trees, reap what they leave, and the
lifeline that stops them when their launcher dies. Used by the local launcher and every node agent."""
