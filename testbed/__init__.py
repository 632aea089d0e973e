"""What the tests and the benchmarks share: real servers on 127.0.0.1, source trees and
images made on the fly, fault corpora, and the pytest plugin that hands them to tests."""
